"""Hugging Face Trainer (with accelerate underneath) training a small BERT built from a config (no
downloads) over the process group this script makes first, as docs/pytorch.md tells CPU users
to do (accelerate's own ddp_backend choice on CPU admits only gloo and mpi).
Usage: hf_trainer.py BACKEND OUT. Writes the trained parameters (rank 0) to OUT."""
import sys
import tempfile

import torch
import torch.distributed as dist

import smddp  # noqa: F401
from common import checker

backend, out = sys.argv[1], sys.argv[2]
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
check, done = checker()

from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()


class Tokens(torch.utils.data.Dataset):
    """Random token sequences with labels, the same on every rank (the sampler shards them)."""

    def __init__(self, n=64, length=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (n, length), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


torch.manual_seed(0)
config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32)
model = BertForSequenceClassification(config)
initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4, max_steps=6, learning_rate=1e-3,
                             report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    result = trainer.train()
check("trained 6 steps", result.global_step == 6, result.global_step)
check("Trainer kept our process group", dist.get_backend() == backend, dist.get_backend())
check("Trainer's world", trainer.args.world_size == world, trainer.args.world_size)
wrapped = getattr(trainer, "model_wrapped", None)
check("model wrapped in DDP", isinstance(wrapped, torch.nn.parallel.DistributedDataParallel), type(wrapped))
# Every rank ends with the same weights (gloo compares, whatever the backend under test).
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
check("parameters moved", not torch.allclose(flat, initial), "training left the model unchanged")
gloo = dist.new_group(backend="gloo")
both = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(both, flat, group=gloo)
check("ranks agree", all(torch.equal(both[0], b) for b in both), "parameters differ between ranks")
if rank == 0:
    torch.save(flat, out)
dist.destroy_process_group()
done()
