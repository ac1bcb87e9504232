"""Exercise 04.2 (a global mean and variance): wrong answers and differently written right ones."""

import jax
import jax.numpy as jnp
import pytest

from course_lib.exercises import check


def local(x, a):
    return jnp.mean(x), jnp.var(x)


def mean_of_variances(x, a):
    return jax.lax.pmean(jnp.mean(x), a), jax.lax.pmean(jnp.var(x), a)


def summed_means(x, a):
    mean = jax.lax.psum(jnp.mean(x), a)
    return mean, jax.lax.psum(jnp.mean((x - mean) ** 2), a)


def standard_deviation(x, a):
    mean = jax.lax.pmean(jnp.mean(x), a)
    return mean, jnp.sqrt(jax.lax.pmean(jnp.mean((x - mean) ** 2), a))


def sample_variance(x, a):
    mean = jax.lax.pmean(jnp.mean(x), a)
    count = x.size * jax.lax.axis_size(a)
    return mean, jax.lax.psum(jnp.sum((x - mean) ** 2), a) / (count - 1)


def squared_deviations_summed(x, a):
    mean = jax.lax.pmean(jnp.mean(x), a)
    return mean, jax.lax.psum(jnp.mean((x - mean) ** 2), a)


def variance_not_averaged(x, a):        # the global mean, but each device's variance of its own shard
    mean = jax.lax.pmean(jnp.mean(x), a)
    return mean, jnp.mean((x - mean) ** 2)


def variance_of_device_means(x, a):
    means = jax.lax.all_gather(jnp.mean(x), a)
    return means.mean(), means.var()


def pmean_of_sums_over_n_minus_1(x, a):  # a pmean of per-device sums, divided by the count minus one
    mean = jax.lax.pmean(jnp.mean(x), a)
    return mean, jax.lax.pmean(jnp.sum((x - mean) ** 2), a) / (x.size * jax.lax.axis_size(a) - 1) * x.size


def swapped(x, a):                      # (var, mean): the pair the wrong way round
    mean = jax.lax.pmean(jnp.mean(x), a)
    return jax.lax.pmean(jnp.mean((x - mean) ** 2), a), mean


WRONG = [
    (swapped, ["the mean (output [0]): expected [10.6151,", "]: 5.38x too large. The two outputs are swapped"]),
    (variance_not_averaged, ["agree on the mean but not on the variance", "its own shard's values only"]),
    (variance_of_device_means, ["the variance of the 8 shard means"]),
    (pmean_of_sums_over_n_minus_1, ["the variance (output [1]): expected [57.085,", "]: 1.31x too small"]),
    (local, ["The devices disagree", "own shard's statistics"]),
    (mean_of_variances, ["per-device variances", "its own shard's mean"]),
    (summed_means, ["times the mean of all the data", "what adding the 8 shard means gives"]),
    (standard_deviation, ["the standard deviation of all the data"]),
    (sample_variance, ["the sample variance"]),
    (squared_deviations_summed, ["times too large", "added, not averaged"]),
    (lambda x, a: jax.lax.pmean(jnp.mean(x), a), ["expected a tuple of 2"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("04.2", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message
    assert "use pmean" not in fb.message.lower()


def second_moment(x, a):                # E[x^2] - E[x]^2, both averaged over the devices
    mean = jax.lax.pmean(jnp.mean(x), a)
    return mean, jax.lax.pmean(jnp.mean(x * x), a) - mean ** 2


def gather_everything(x, a):
    everything = jax.lax.all_gather(x, a)
    return jnp.mean(everything), jnp.var(everything)


@pytest.mark.parametrize("answer", [second_moment, gather_everything])
def test_right_answers_written_differently_pass(answer):
    fb = check("04.2", answer)
    assert fb, fb.message
