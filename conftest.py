"""Settings shared by the unit tests and the notebook kernels that nbval starts.

nbval starts each notebook's kernel with this process's environment, so what is set
here is what the notebooks see: 8 simulated CPU devices unless the caller chose
otherwise, and no debugger warnings on the kernel's stderr.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns on stderr otherwise
