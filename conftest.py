"""Settings shared by the unit tests and the notebook kernels that nbval starts.

nbval starts each notebook's kernel with this process's environment, so what is set
here is what the notebooks see: 8 simulated CPU devices unless the caller chose
otherwise (on the CPU even where an accelerator exists), and no debugger warnings on the kernel's stderr.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
# The stored outputs were made on 8 simulated CPU devices; on a machine with a GPU or TPU, the notebooks
# under test still run there (set JAX_PLATFORMS yourself to run them on the accelerator, without nbval's
# comparison holding).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns on stderr otherwise
