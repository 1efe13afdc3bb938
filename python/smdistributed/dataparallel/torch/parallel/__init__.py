"""smdistributed.dataparallel.torch.parallel: the old API's DistributedDataParallel."""
