"""torch_weft.torchrun - torchrun that starts on Debian 12.

Debian 12 ships torch 1.13 with Python 3.11, where Std.from_str("0") (the
default of --redirects and --tee) returns None: 3.11's IntFlag iteration
skips the zero and alias members it searched, so /usr/bin/torchrun dies
before starting a worker.  This parses those values directly, then runs
torch.distributed.run unchanged:

    /usr/bin/python3 -m torch_weft.torchrun --standalone --nproc_per_node 4 train.py
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed import run


def _from_str(cls, vm):
    if re.fullmatch(r"[0-3]", vm):
        return cls(int(vm))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match a value (0-3) or a mapping (0:1,1:2)")


if api.Std.from_str("0") is None:
    api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    sys.exit(run.main())
