"""torch_weft - registers weft as torch.distributed's "weft" backend.

    import torch_weft  # noqa: F401  (registers the backend)
    torch.distributed.init_process_group("weft")

CPU tensors only.  Rank 0 makes a weft unique id and publishes it in the
c10d store (the store torchrun or init_method gives), every rank joins with
it.  Errors are RuntimeErrors whose text starts "weft rank R:".
"""
import torch  # loads libtorch before the extension that links it
import torch.distributed as dist

from . import _C

__all__ = ["create_process_group", "weft_version"]


def create_process_group(store, rank, size, timeout):
    """The creator torch.distributed calls for backend "weft".

    weft keeps its own deadline (WEFT_TIMEOUT_MS, default 300 s) for a peer
    that stops answering; `timeout` bounds only the store rendezvous.
    """
    del timeout
    return _C.create_process_group(store, rank, size)


def weft_version():
    return _C.version()


if "WEFT" not in dist.Backend._plugins:
    dist.Backend.register_backend("weft", create_process_group)
