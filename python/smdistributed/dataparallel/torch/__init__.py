"""Compatibility alias: scripts written for SageMaker's smdistributed.dataparallel run on smddp."""
