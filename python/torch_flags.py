"""torch_flags.py - prints what python/Makefile needs from the installed
torch, as torch.utils.cpp_extension would pass it: `inc`, `lib`, `defs`,
`ext` (the extension suffix) or `site` (where `make install` puts it)."""
import os
import sys
import sysconfig

what = sys.argv[1]
if what == "ext":
    print(sysconfig.get_config_var("EXT_SUFFIX"))
    sys.exit(0)
if what == "site":
    scheme = "posix_local" if "posix_local" in sysconfig.get_scheme_names() else None
    print(sysconfig.get_path("purelib", scheme) if scheme else sysconfig.get_path("purelib"))
    sys.exit(0)
import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

if what == "inc":
    dirs = cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    print(" ".join("-isystem " + d for d in dirs))
elif what == "lib":
    print(os.path.join(os.path.dirname(torch.__file__), "lib"))
elif what == "defs":
    defs = ["-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]
    # pybind11 shares its type registry only between modules built alike.
    for k in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        defs.append("'-DPYBIND11_%s=\"%s\"'" % (k, getattr(torch._C, "_PYBIND11_" + k)))
    print(" ".join(defs))
else:
    sys.exit("torch_flags.py: unknown query " + what)
