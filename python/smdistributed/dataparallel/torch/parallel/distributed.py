"""`from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel`.

SMDDP's wrapper took torch's arguments (module, device_ids, output_device, broadcast_buffers,
process_group, bucket_cap_mb); torch's own DistributedDataParallel over the "smddp" process group
does what it did.
"""
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

import smddp  # noqa: F401  (registers the backend)


class DistributedDataParallel(_TorchDDP):
    """torch.nn.parallel.DistributedDataParallel under SMDDP's old import path."""
