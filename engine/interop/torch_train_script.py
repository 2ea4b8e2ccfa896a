"""The PyTorch training script `export_training_script` writes as `train.py` (the same text for every export;
it reads `train_config.json` beside it). Kept as text: nothing here runs in Ember, and torch is not imported."""

__all__ = ["TRAIN_PY"]

TRAIN_PY = '''\
"""Fine-tune a causal language model with PyTorch + transformers + peft.

Written by Ember's File > Export > Training script. The run itself (model folder, LoRA,
frozen parameters, optimizer, batches) is in train_config.json beside this file.

    python train.py                                # one process: a GPU if there is one, else the CPU
    torchrun --nproc_per_node 8 train.py           # DistributedDataParallel on 8 GPUs
    accelerate launch train.py                     # the same with accelerate's launcher / config

Options: --steps N (stop after N optimizer steps), --out DIR (where the trained adapter or
model goes; default ./trained), --losses FILE (write every step's loss as JSON), --tokenize
(make the token rows again from the text files instead of reading tokens.safetensors; not for
conversation data, whose rows Ember rendered with the chat template and masked).

tokens.safetensors holds the rows Ember trains on: input ids, labels (-100 where nothing is
learnt: pads, prompts, and for conversations every token that is not the assistant's) and the
attention mask (1: a real position, 0: padding), so a chat fine-tune continues on the very
rendered rows and assistant-only masks Ember made.

Every process takes its share of each batch; the loss of an optimizer step is the mean
next-token cross entropy over all of its targets (all micro-batches, all processes), as Ember
computes it, so the run reproduces Ember's steps on the same data and initial weights.
"""
import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
IGNORE = -100  # a target that counts for nothing (pads, prompt tokens)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(HERE / "train_config.json"))
    ap.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps")
    ap.add_argument("--out", default=str(HERE / "trained"))
    ap.add_argument("--losses", default=None, help="write the step losses to this JSON file")
    ap.add_argument("--tokenize", action="store_true", help="tokenize the text files again")
    return ap.parse_args()


# ----------------------------------------------------------------------------- processes
def setup_processes():
    """(rank, world size, device). torchrun and accelerate launch set RANK / WORLD_SIZE /
    LOCAL_RANK; a plain `python train.py` is process 0 of 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def all_sum(x, world):
    """The sum of a float over every process."""
    if world == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t)
    return float(t.item())


# ----------------------------------------------------------------------------- data
def load_rows(cfg, tokenize):
    """{"train_inputs", "train_targets", "train_attention_mask", maybe "valid_..."}: int64 [rows, block]."""
    d = cfg["data"]
    if tokenize and d.get("format") == "conversations":
        raise SystemExit("--tokenize: the data are conversations, rendered with the model's chat template and "
                         "masked to the assistant's turns by Ember; this script trains on the rows Ember wrote "
                         f"({d['tokens']}): export again from Ember after changing the data")
    if tokenize:
        return tokenize_text(d)
    rows = load_file(str(HERE / d["tokens"]))
    found = int((rows["train_targets"] != IGNORE).sum())
    if "train_target_tokens" in d and found != d["train_target_tokens"]:
        raise SystemExit(f"{d['tokens']} holds {found} training targets, train_config.json says "
                         f"{d['train_target_tokens']}: the rows are not the ones exported with this config")
    return rows


def tokenize_text(d):
    """The rows Ember's engine.train.text makes: each document encoded with the tokenizer's
    special tokens and an eos appended (a prompt with them, its completion without, the prompt
    not learnt); packed into overlapping windows of block + 1 ids, or one right-padded row each;
    inputs ids[:-1], targets ids[1:]."""
    from tokenizers import Tokenizer

    if not d.get("file"):
        raise SystemExit("--tokenize: train_config.json names no text file (the rows were given to the export)")
    folder = Path(d["tokenizer"])
    tok = Tokenizer.from_file(str(folder / "tokenizer.json" if folder.is_dir() else folder))
    special = {}
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        special = json.loads(tc.read_text(encoding="utf-8"))

    def token_id(key):
        v = special.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        return tok.token_to_id(v) if isinstance(v, str) else None

    eos, pad = token_id("eos_token"), token_id("pad_token")
    pad = pad if pad is not None else (eos or 0)
    path = Path(d["file"])
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".txt", ".jsonl")) if path.is_dir() else [path]
    docs = []  # (head text, completion text or None)
    for f in files:
        text = f.read_bytes().decode("utf-8-sig")
        if f.suffix.lower() == ".jsonl":
            for line in text.splitlines():
                if line.strip():
                    r = json.loads(line)
                    docs.append((r["text"], None) if "text" in r else (r["prompt"], r["completion"]))
        elif d["per_line"]:
            docs += [(line, None) for line in text.splitlines() if line.strip()]
        else:
            docs.append((text, None))
    tail = [] if eos is None else [eos]
    seqs = []
    for head, completion in docs:
        ids = tok.encode(head).ids
        if completion is None:
            ids = ids + tail
            learn = [True] * len(ids)
        else:
            rest = tok.encode(completion, add_special_tokens=False).ids + tail
            learn = [False] * len(ids) + [True] * len(rest)
            ids = ids + rest
        seqs.append((np.array(ids, np.int64), np.array(learn, bool)))
    T = d["block_size"]
    if d["packing"]:
        ids, learn = np.concatenate([s[0] for s in seqs]), np.concatenate([s[1] for s in seqs])
        windows = [(ids[s:s + T + 1], learn[s:s + T + 1]) for s in range(0, max(len(ids) - 1, 0), T)]
    else:
        windows = [(i[:T + 1], k[:T + 1]) if d["truncate"] else (i, k) for i, k in seqs]
    windows = [w for w in windows if len(w[0]) >= 2 and w[1][1:].any()]
    x = np.full((len(windows), T), pad, np.int64)
    y = np.full((len(windows), T), IGNORE, np.int64)
    m = np.zeros_like(x)  # the attention mask: 1 on the real positions
    for r, (ids, learn) in enumerate(windows):
        x[r, :len(ids) - 1] = ids[:-1]
        y[r, :len(ids) - 1] = np.where(learn[1:], ids[1:], IGNORE)
        m[r, :len(ids) - 1] = 1
    rows = {"train_inputs": x, "train_targets": y, "train_attention_mask": m}
    if d.get("valid_fraction"):  # Ember's seeded split: the first round(fraction * n) of a permutation train
        order = np.random.default_rng(d["split_seed"]).permutation(len(x))
        k = int(round((1.0 - d["valid_fraction"]) * len(x)))
        rows = {f"{part}_{name}": a[idx] for part, idx in (("train", order[:k]), ("valid", order[k:]))
                for name, a in (("inputs", x), ("targets", y), ("attention_mask", m))}
    return rows


def epoch_order(n, seed, epoch, shuffle):
    """The row order of an epoch (from 1), as Ember's DataLoader shuffles: it depends only on
    (seed, epoch)."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch])).permutation(n)


def batches(order, batch_size, drop_last):
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    return [order[s:s + batch_size] for s in range(0, stop, batch_size)]


# ----------------------------------------------------------------------------- model
def build_model(cfg, device):
    base = Path(cfg["model"]["base"])
    base = base if base.is_absolute() else HERE / base
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    lora = cfg["lora"]
    if lora is not None:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        config = LoraConfig(r=lora["r"], lora_alpha=lora["lora_alpha"], target_modules=lora["target_modules"],
                            use_rslora=lora["use_rslora"], use_dora=lora["use_dora"],
                            rank_pattern=lora["rank_pattern"], alpha_pattern=lora["alpha_pattern"],
                            fan_in_fan_out=lora["fan_in_fan_out"], lora_dropout=0.0,
                            bias=lora.get("bias", "none"), modules_to_save=lora.get("modules_to_save"),
                            target_parameters=lora.get("target_parameters"), task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
        # start from the adapter Ember initialized, not peft's random one
        state = load_file(str(HERE / lora["initial_adapter"] / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, {k: torch.from_numpy(v) for k, v in state.items()})
        if getattr(result, "unexpected_keys", None):
            raise SystemExit(f"the initial adapter has tensors the model lacks: {result.unexpected_keys[:3]}")
    # trainability as in Ember: the frozen parameters by their Hugging Face / peft names
    frozen = set(cfg["frozen_parameters"])
    for name, p in model.named_parameters():  # a module of modules_to_save trains its copy, not the original
        p.requires_grad_(".original_module." not in name and plain_name(name) not in frozen)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable != cfg["trainable_values"]:
        raise SystemExit(f"{trainable} trainable values, Ember trains {cfg['trainable_values']}: the names in "
                         f"train_config.json do not fit this model")
    return model.to(device)


def plain_name(name):
    """A torch parameter name without peft's wrapping: base_model.model.X.base_layer.weight -> X.weight,
    X.lora_A.default.weight -> X.lora_A.weight, X.modules_to_save.default.weight -> X.weight."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    while ".base_layer." in name:  # peft nests a ParamWrapper per targeted parameter (a mixture's fused experts)
        name = name.replace(".base_layer.", ".")
    name = name.replace(".default.", ".").removesuffix(".default")
    return name.replace(".modules_to_save.", ".")


def make_optimizer(params, o):
    if o["name"] == "AdamW":
        return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                 weight_decay=o["weight_decay"])
    if o["name"] == "Adam":
        return torch.optim.Adam(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                weight_decay=o["weight_decay"], amsgrad=o["amsgrad"])
    return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], dampening=o["dampening"],
                           nesterov=o["nesterov"], weight_decay=o["weight_decay"])


def batch_of(rows, part, idx, device):
    """(input ids, labels, the model's other arguments) of the rows `idx` of `part` ("train" or
    "valid"). Right-padded rows: their attention mask (under causal attention no real token sees a
    pad, so it changes nothing at the positions with targets; passed as a transformers user would).
    Packed rows (several conversations a row): each conversation's positions from 0 and a
    block-diagonal causal mask, so each attends only to itself."""
    def get(name):
        key = f"{part}_{name}"
        return torch.from_numpy(rows[key][idx]).to(device) if key in rows else None

    x, y, extra = get("inputs"), get("targets"), {}
    segments = get("segment_ids")
    if segments is not None:
        extra = {"attention_mask": packed_mask(segments), "position_ids": get("position_ids")}
    elif get("attention_mask") is not None:
        extra = {"attention_mask": get("attention_mask")}
    return x, y, extra


def packed_mask(segments):
    """[batch, 1, T, T] additive attention mask of packed rows: a position sees the earlier
    positions of its own sequence (segment 1, 2, ...); a pad (segment 0) sees itself alone."""
    T = segments.shape[1]
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0)
    allow = same & torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    allow |= torch.eye(T, dtype=torch.bool, device=segments.device)
    blocked = torch.full(allow.shape, torch.finfo(torch.float32).min, device=segments.device)
    return torch.where(allow, torch.zeros((), device=segments.device), blocked)[:, None]


def token_loss_sum(model, x, y, extra):
    """The summed cross entropy over the targets that are not IGNORE."""
    logits = model(input_ids=x, **extra).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


# ----------------------------------------------------------------------------- training
def main():
    args = parse_args()
    cfg = json.loads(Path(args.config).read_text(encoding="utf-8"))
    rank, world, device = setup_processes()
    t, o = cfg["training"], cfg["optimizer"]
    torch.manual_seed(t["seed"])
    rows = load_rows(cfg, args.tokenize)
    x_all, y_all = rows["train_inputs"], torch.from_numpy(rows["train_targets"])
    model = build_model(cfg, device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = make_optimizer(params, o)
    warm = o["warmup_steps"]  # step k of the warm-up uses lr * k / warm (Ember's linear warm-up)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0)
    accum, losses, step = t["grad_accumulation"], [], 0
    if rank == 0:
        print(f"{len(x_all)} training rows of {x_all.shape[1]} tokens, {world} process(es) on {device}, "
              f"{sum(p.numel() for p in params):,} trainable values")
    for epoch in range(1, t["num_epochs"] + 1):
        order = batches(epoch_order(len(x_all), t["seed"], epoch, t["shuffle"]), t["batch_size"], t["drop_last"])
        for first in range(0, len(order), accum):
            group = order[first:first + accum]  # the micro-batches of one optimizer step
            total = sum(int((y_all[b] != IGNORE).sum()) for b in group)  # targets of the whole step
            loss_sum = 0.0
            for k, b in enumerate(group):
                mine = b[rank::world]  # this process's share of the batch
                x, y, extra = batch_of(rows, "train", mine, device)
                last = k == len(group) - 1
                sync = net.no_sync() if world > 1 and not last else _nothing()
                with sync:
                    if len(mine):
                        part = token_loss_sum(net, x, y, extra)
                        # DDP averages gradients over processes: * world makes it their sum
                        (part * (world / max(total, 1))).backward()
                        loss_sum += float(part.detach())
                    elif world > 1 and last:  # nothing here, but the gradient all-reduce needs everyone
                        (sum(p.sum() for p in params) * 0.0).backward()
            loss = all_sum(loss_sum, world) / max(total, 1)
            if o["max_grad_norm"] is not None:  # one global L2 norm over every trainable tensor, as Ember clips
                torch.nn.utils.clip_grad_norm_(params, o["max_grad_norm"])
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            losses.append(loss)
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss:.6f} lr {lr:.3g}", flush=True)
            if args.steps is not None and step >= args.steps:
                break
        if args.steps is not None and step >= args.steps:
            break
        if "valid_inputs" in rows:
            validate(net, rows, t["valid_batch_size"], rank, world, device, epoch)
    if rank == 0:
        if args.losses:
            Path(args.losses).write_text(json.dumps(losses), encoding="utf-8")
        model.save_pretrained(args.out)  # the adapter (peft) or the whole model
        print(f"saved to {args.out}")
    if world > 1:
        dist.destroy_process_group()


def validate(net, rows, batch_size, rank, world, device, epoch):
    total, loss, n = 0, 0.0, len(rows["valid_inputs"])
    with torch.no_grad():
        for s in range(rank * batch_size, n, batch_size * world):
            x, y, extra = batch_of(rows, "valid", np.arange(s, min(s + batch_size, n)), device)
            loss += float(token_loss_sum(net, x, y, extra))
            total += int((y != IGNORE).sum())
    loss, total = all_sum(loss, world), all_sum(total, world)
    if rank == 0:
        mean = loss / max(total, 1)
        print(f"epoch {epoch} validation loss {mean:.6f} perplexity {math.exp(min(mean, 50)):.3f}", flush=True)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
'''
