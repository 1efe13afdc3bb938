"""Drop-in for SageMaker's `import smdistributed.dataparallel.torch.torch_smddp`.

Importing it registers the "smddp" torch.distributed backend, exactly like `import smddp`, so
scripts written for SageMaker's SMDDP library run unchanged.
"""
import smddp  # noqa: F401  (registers the backend)

from smddp import __version__  # noqa: F401
