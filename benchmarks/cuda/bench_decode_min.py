# Batched greedy decoding with transformers on one GPU, 8B-shaped random bf16 Llama (no vLLM on the
# GPU machine): a lower bound for regeneration's rate. Run as `python3 bench_decode_min.py 64 256`
# (batch sizes); prints one JSON line per batch size. Results: results/h200_8b_decode_transformers.*
import json
import sys
import time

import torch
from transformers import LlamaConfig as C
from transformers import LlamaForCausalLM as M

c = C(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=5e5,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
torch.manual_seed(0)
with torch.device("cuda"):
    m = M(c).to(torch.bfloat16).eval()
for b in map(int, sys.argv[1:]):
    i = torch.randint(3, c.vocab_size, (b, 128), device="cuda")
    k = dict(max_new_tokens=256, min_new_tokens=256, do_sample=False, attention_mask=torch.ones_like(i))
    with torch.inference_mode():
        m.generate(i, **k)
        T = []
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            g = m.generate(i, **k)
            torch.cuda.synchronize()
            T.append(time.perf_counter() - t)
    n = g.shape[1] - 128
    print(
        json.dumps(
            {
                "batch": b,
                "new_tokens": n,
                "seconds": [round(x, 2) for x in T],
                "tokens_per_s": [round(b * n / x) for x in T],
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
            }
        ),
        flush=True,
    )
