"""python -m smddp.info: what this smddp is, how it was built, and what it sees."""
import os
import platform
import shutil
import socket
import subprocess


def _libfabric():
    """(version, providers) from libfabric's own fi_info tool, when it is installed."""
    tool = shutil.which("fi_info")
    if not tool:
        return "unknown (fi_info not installed)", []
    try:
        version = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=10).stdout
        listing = subprocess.run([tool, "-l"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})", []
    ver = next((l.split(":", 1)[1].strip() for l in version.splitlines() if l.startswith("libfabric")), version.strip())
    providers = [l.strip().rstrip(":") for l in listing.splitlines() if l.strip().endswith(":")]
    return ver, providers


def main():
    import torch
    import smddp
    from smddp import _C

    print(f"smddp {smddp.__version__}")
    print(f"  build:            {_C.build_info()}")
    print(f"  built for torch:  {_C.torch_version_built}   running torch: {torch.__version__}")
    print(f"  reduce kernels:   {_C.reduce_isa()}")
    print(f"  backend:          registered as 'smddp': {smddp.is_registered()}")
    ver, providers = _libfabric()
    print(f"  libfabric:        {ver}")
    print(f"  providers:        {', '.join(providers) if providers else '-'}")
    print("topology (this node)")
    print(f"  host:             {socket.gethostname()} ({platform.machine()})")
    print(f"  cpus:             {os.cpu_count()}")
    local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    print(f"  local ranks:      {local or 'unknown outside a launcher'}")
    print(f"  transports:       shm (inside a node)")
    print("settings (SMDDP_*)")
    for name, default, value, meaning in _C.env_params():
        mark = "" if name not in os.environ else "   (from environment)"
        print(f"  {name:<20} = {value!r}{mark}")


if __name__ == "__main__":
    main()
