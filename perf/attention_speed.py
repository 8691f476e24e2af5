"""The policy's two attention paths on the CPU: torch's SDPA vs the model's grouped eager path.

What it measures: forward + backward of :func:`scopebench.policy.pi05.layers.attention` at one
layer of a preset's joint training sequence (batch, heads, key/value heads, head size and
tokens of the preset; the block-causal mask of a real batch is replaced by a random one
with the same shape), ``impl="sdpa"`` and ``impl="eager"`` alternating call by call, so
background load hits both alike. Reported: the median time of each and the median ratio
eager / sdpa over rounds, with its spread. Why: ``attention_implementation`` is a choice
people make per device, and on a CPU the answer is not torch's default.

How to run (one process, no launcher)::

    python perf/attention_speed.py                 # small, 2 threads
    python perf/attention_speed.py --preset tiny --threads 1

Output: readable lines, then one JSON object on the last line::

    {"preset", "shape": {"batch", "heads", "kv_heads", "head_dim", "tokens"}, "num_threads",
     "sdpa_sec", "eager_sec", "ratio", "ratio_min", "ratio_max", "rounds", "load_average",
     "conditions"}   # perf/round_conditions.py: other processes' CPU share and steal per round
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from round_conditions import RoundConditions

from scopebench.policy.pi05.config import make_config
from scopebench.policy.pi05.layers import attention, mask_to_bias
from scopebench.stats import median


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = make_config(args.preset)
    tokens = cfg.prefix_len(True) + cfg.chunk_size  # the joint training sequence
    b, h, kv, hd = args.batch_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, tokens, hd, generator=gen, requires_grad=True)
    k = torch.randn(b, kv, tokens, hd, generator=gen, requires_grad=True)
    v = torch.randn(b, kv, tokens, hd, generator=gen, requires_grad=True)
    bias = mask_to_bias(torch.rand(b, tokens, tokens, generator=gen) > 0.2, torch.float32)
    grad = torch.randn(b, h, tokens, hd, generator=gen)

    def call(impl: str) -> float:
        start = time.perf_counter()
        torch.autograd.grad(attention(q, k, v, bias, impl), (q, k, v), grad)
        return time.perf_counter() - start

    for impl in ("sdpa", "eager"):  # warm-up
        call(impl)
    times: dict[str, list[float]] = {"sdpa": [], "eager": []}
    ratios = []
    conditions = RoundConditions()
    for r in range(args.rounds):
        with conditions.round():
            for impl in ("sdpa", "eager") if r % 2 == 0 else ("eager", "sdpa"):
                times[impl].append(call(impl))
        ratios.append(times["eager"][-1] / times["sdpa"][-1])
        print(f"round {r}: eager/sdpa {ratios[-1]:.3f} {conditions.tag()}", flush=True)
    result = {
        "preset": args.preset,
        "shape": {"batch": b, "heads": h, "kv_heads": kv, "head_dim": hd, "tokens": tokens},
        "num_threads": torch.get_num_threads(),
        "sdpa_sec": median(times["sdpa"]),
        "eager_sec": median(times["eager"]),
        "ratio": median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds": args.rounds,
        "load_average": list(os.getloadavg()),
        "conditions": conditions.as_dict(),
    }
    print(
        f"{args.preset}: B={b} H={h} KV={kv} hd={hd} T={tokens}, {result['num_threads']} threads, forward+backward: "
        f"sdpa {result['sdpa_sec'] * 1e3:.1f} ms, eager {result['eager_sec'] * 1e3:.1f} ms, eager/sdpa "
        f"{result['ratio']:.3f} (rounds {result['ratio_min']:.3f}..{result['ratio_max']:.3f}); load {result['load_average']}"
    )
    print(conditions.summary_line())
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
