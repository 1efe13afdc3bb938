"""Make torchrun work with Debian's torch, which is built without libuv.

torch.distributed.TCPStore defaults to the libuv server (use_libuv=True), and torchrun's
rendezvous creates its store without passing use_libuv, so with a libuv-less torch every
`torchrun` fails with "use_libuv was requested but PyTorch was build without libuv support";
USE_LIBUV=0 does not reach that code path. This module is loaded at interpreter start by
smddp_torch_nolibuv.pth inside the devenv roots (tools/devenv) and, once torch.distributed has
been imported, replaces TCPStore with a subclass that always passes use_libuv=False. It never
imports torch itself, so Python programs that do not use torch pay nothing.
See docs/devenv.md.
"""
import importlib.abc
import importlib.machinery
import sys

_TARGET = "torch.distributed"


def _patch(module):
    original = getattr(module, "TCPStore", None)
    if original is None or getattr(original, "_smddp_nolibuv", False):
        return

    class TCPStore(original):  # noqa: D401 - same API as torch's
        __doc__ = original.__doc__
        _smddp_nolibuv = True

        def __init__(self, *args, **kwargs):
            if len(args) >= 9:  # use_libuv is the 9th positional parameter
                args = args[:8] + (False,) + args[9:]
            else:
                kwargs["use_libuv"] = False
            super().__init__(*args, **kwargs)

    TCPStore.__name__ = TCPStore.__qualname__ = "TCPStore"
    TCPStore.__module__ = original.__module__
    # Rebind every already-imported torch.distributed module that holds the original class.
    for name, mod in list(sys.modules.items()):
        if name == _TARGET or name.startswith(_TARGET + "."):
            if getattr(mod, "TCPStore", None) is original:
                setattr(mod, "TCPStore", TCPStore)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            _patch(module)
        except Exception:  # never break torch's import because of this shim
            pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
