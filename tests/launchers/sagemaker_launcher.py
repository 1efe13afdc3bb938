"""A launcher in the style of seed 002 (SageMaker's "PyTorch distribution options" example): run
on every host of the training cluster with SageMaker's variables, it starts torch.distributed.run
with the host's rank in SM_HOSTS and the rendezvous on SM_HOSTS[0]. The lines below are the
seed's, with its hyperparameter handling left out.

    python3 sagemaker_launcher.py TRAIN_SCRIPT [ARGS...]
"""
import json
import os
import subprocess
import sys

RDZV_PORT = 7777


def main():
    nodes = json.loads(os.getenv("SM_HOSTS"))
    nnodes = len(nodes)
    node_rank = nodes.index(os.getenv("SM_CURRENT_HOST"))
    nproc_per_node = os.getenv("SM_NUM_GPUS", 1)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc_per_node}",
        f"--nnodes={str(nnodes)}",
        f"--node_rank={node_rank}",
        f"--rdzv_id={os.getenv('SAGEMAKER_JOB_NAME')}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={nodes[0]}:{RDZV_PORT}",
        sys.argv[1],
    ]
    cmd.extend(sys.argv[2:])
    process = subprocess.Popen(cmd, env=os.environ)
    process.wait()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)


if __name__ == "__main__":
    main()
