"""What a PyTorch monitor watches (`capture.torch`): the module inside the wrappers, the
parameter names users know, and a DeepSpeed engine, found by its interface so DeepSpeed is never
imported."""

import re

import torch


def unwrapped(model):
    """The module whose parameter names users know, inside `DistributedDataParallel` (``.module``)
    and `torch.compile` (``._orig_mod``) wrappers, so rows are not all prefixed ``module.``."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


# Wrappers that insert themselves into parameter names: FSDP1, activation checkpointing and
# `torch.compile` on a submodule.
_WRAPPER_PREFIXES = re.compile(
    r"(?:^|(?<=\.))(?:_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.")


def user_parameter_name(name):
    """``_fsdp_wrapped_module.0._checkpoint_wrapped_module.weight`` -> ``0.weight``."""
    return _WRAPPER_PREFIXES.sub("", name)


def deepspeed_engine(model):
    """The DeepSpeed engine `model` is (``deepspeed.initialize``'s first result), or None. Found
    by its interface, so DeepSpeed is never imported here."""
    if callable(getattr(model, "zero_optimization_stage", None)) and callable(
            getattr(model, "is_gradient_accumulation_boundary", None)):
        return model
    return None
