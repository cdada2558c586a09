"""``adam_rms`` for an optax optimizer that `jax.gradient_monitor` wraps: read from the state of
its ``scale_by_adam`` (optax's ``adam``, ``adamw``, ``nadam``, ``lamb``, ... and any chain or
``inject_hyperparams`` around them).

The state holds Adam's moments and step count, not its hyper-parameters, and the gradient Adam
received may differ from the one the monitor logs (an ``optax.clip_by_global_norm`` before it
in the chain). Both come from the state itself:

* ``beta2``, once, when the state is made: the optimizer's own ``update`` is run on a copy of
  the fresh state whose second moment is all ones, with zero gradients (every gradient
  transformation maps 0 to 0), so the new second moment is ``beta2 * 1 + (1 - beta2) * 0``:
  exactly the ``beta2`` Adam uses, in its dtype. optax is functional: nothing of the real
  state changes.
* each step's ``g^2`` as Adam received it: ``(nu_new - beta2 * nu_old) / (1 - beta2)``, from the
  second moment before and after the step (``nu_new = beta2 nu_old + (1 - beta2) g^2``), both
  at hand in the update without a copy.

The subtraction cancels: each entry's ``g^2`` carries an absolute error of about ``u nu_new /
(1 - beta2)`` (u: the unit roundoff of nu's dtype), so each ``g^2 / v_hat`` one of about
``u / (1 - beta2)`` (6e-5 at float32 and beta2 0.999) against the RMS's typical 1: small beside
what the column is for (an RMS far above 1).
"""

import logging

import jax
import jax.numpy as jnp

from tensorboard_gradients.format import statistics

logger = logging.getLogger(__name__)


def _is_adam(node):
    import optax

    return isinstance(node, optax.ScaleByAdamState)


def _adam_states(state):
    return [node for node in jax.tree_util.tree_leaves(state, is_leaf=_is_adam) if _is_adam(node)]


def second_moment_decay(optimizer, state, params):
    """The ``beta2`` of the one ``scale_by_adam`` in ``optimizer`` (its fresh ``state``; the
    ``params`` it was made for), a scalar array; None (with a warning) when there is none, more
    than one, or its ``update`` cannot run without extra arguments."""
    found = _adam_states(state)
    if len(found) != 1:
        if found:
            logger.warning("gradient_monitor: adam_rms is not logged: the optimizer holds %d "
                           "Adam states, it reads one", len(found))
        return None
    ones = jax.tree_util.tree_map(
        lambda node: node._replace(nu=jax.tree_util.tree_map(jnp.ones_like, node.nu))
        if _is_adam(node) else node, state, is_leaf=_is_adam)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    try:
        _, stepped = optimizer.update(zeros, ones, params)
    except Exception as error:  # an optimizer that needs its extra arguments (a loss value)
        logger.warning("gradient_monitor: adam_rms is not logged: the optimizer's update "
                       "did not run on zero gradients to read its beta2 (%s)", error)
        return None
    leaves = jax.tree_util.tree_leaves(_adam_states(stepped)[0].nu)
    return jnp.ravel(leaves[0])[0] if leaves else None


def adam_state(state):
    """The ``optax.ScaleByAdamState`` in an optimizer's state (`second_moment_decay` found one)."""
    return _adam_states(state)[0]


def adam_rms(ops, old_seconds, new_seconds, count, beta2, dtype):
    """`statistics.adam_rms` of a step (in ``dtype``, over ``ops``) from Adam's second moment of
    the watched leaves before and after it (None: a leaf Adam does not hold), its new count and
    its ``beta2``. Each leaf's ``g^2`` as Adam received it is ``(nu_new - beta2 * nu_old) / (1 -
    beta2)`` (see the module for the rounding)."""
    beta2 = beta2.astype(dtype)
    gradients, seconds = [], []
    for old, new in zip(old_seconds, new_seconds):
        if new is None:
            gradients.append(None)
            seconds.append(None)
            continue
        new = new.astype(dtype)
        gradients.append(jnp.sqrt(jnp.maximum(new - beta2 * old.astype(dtype), 0) / (1 - beta2)))
        seconds.append(new)
    correction = 1 - beta2 ** count.astype(dtype)
    return statistics.adam_rms(ops, gradients, seconds, correction)
