"""Compare two evaluations of the same prompts, prompt by prompt (a paired bootstrap).

    python benchmarks/compare_acceptance.py A.json B.json [--set test] [--draft-a trained]
        [--draft-b trained] [--seed 0] [--resamples 2000] [--json OUT] [--unpaired]

A and B are `results/eval/acceptance.json` files (or the `acceptance` of a benchmarks/results
record). Prints A − B: the difference of mean acceptance lengths on the set with its paired
bootstrap 95% interval (prompts resampled, the same resample for both drafts) and the
differences per draft position. Stops, naming them, when the two sets' prompts differ.
The same file twice with --draft-a trained --draft-b untrained gives the file's own
`trained_minus_untrained`. The code is draftline.artifacts.acceptance.

--unpaired: when A holds no per-prompt counts (a vLLM without `per_request_spec_decode_metrics`,
added in vLLM 0.29: the H200 host's vLLM 0.26 keeps none), A's set figure (from its counters) is
set against B's own 95% bootstrap interval over B's prompts: inside or outside it. Weaker than the
paired comparison (A's own spread is unknown), and said so in what it prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftline.artifacts.acceptance import RESAMPLES, compare_files, draft_block, intervals, read  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="acceptance.json A")
    parser.add_argument("b", help="acceptance.json B")
    parser.add_argument("--set", default="test", help="prompt set (default: test)")
    parser.add_argument("--draft-a", default="trained", help="draft in A (default: trained)")
    parser.add_argument("--draft-b", default="trained", help="draft in B (default: trained)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--unpaired", action="store_true", help="A without per-prompt counts: its set figure "
                        "against B's own 95%% interval")
    args = parser.parse_args(argv)
    try:
        if args.unpaired:
            return unpaired(args)
        result = compare_files(args.a, args.b, args.set, args.draft_a, args.draft_b, seed=args.seed, count=args.resamples)
    except ValueError as error:
        print(f"compare_acceptance: {error}", file=sys.stderr)
        if "no per_prompt counts" in str(error) and not args.unpaired:
            print("compare_acceptance: --unpaired sets A's set figure against B's own interval", file=sys.stderr)
        return 1
    mean_a, mean_b = result["mean_acceptance_lengths"]
    low_high = result["bootstrap_95"] or ["n/a", "n/a"]
    print(f"set {args.set!r}, {result['prompts']} prompts paired by id")
    print(f"A {args.a} ({args.draft_a}): mean acceptance length {mean_a}")
    print(f"B {args.b} ({args.draft_b}): mean acceptance length {mean_b}")
    print(f"A - B: {result['mean_acceptance_length']:+.4f}, paired 95% bootstrap [{low_high[0]}, {low_high[1]}] ({result['bootstrap']})")
    intervals = result["acceptance_per_position_bootstrap_95"] or [None] * len(result["acceptance_per_position"])
    for i, (d, ci) in enumerate(zip(result["acceptance_per_position"], intervals, strict=True)):
        print(f"  position {i}: {d:+.4f}" + (f" [{ci[0]}, {ci[1]}]" if ci else ""))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            inputs = {"a": args.a, "b": args.b, "set": args.set, "draft_a": args.draft_a, "draft_b": args.draft_b}
            json.dump({**inputs, **result}, out, indent=1)
            out.write("\n")
    return 0


def unpaired(args) -> int:
    """A's set figure (its counters) against B's 95% bootstrap interval over B's own prompts."""
    a_set = read(args.a).get("sets", {}).get(args.set, {})
    a_draft = a_set.get("drafts", {}).get(args.draft_a)
    if not a_draft or a_draft.get("mean_acceptance_length") is None:
        raise ValueError(f"{args.a}: no sets.{args.set}.drafts.{args.draft_a}.mean_acceptance_length")
    b = intervals(draft_block(read(args.b), args.b, args.set, args.draft_b), seed=args.seed, count=args.resamples)
    mean_a, (low, high) = round(a_draft["mean_acceptance_length"], 4), b["bootstrap_95"]
    inside = low <= mean_a <= high
    print(f"set {args.set!r}, not paired (A's spread unknown: its file has no per-prompt counts)")
    print(f"A {args.a} ({args.draft_a}): mean acceptance length {mean_a} (its counters)")
    print(f"B {args.b} ({args.draft_b}): mean acceptance length {b['mean_acceptance_length']}, 95% bootstrap over its "
          f"{b['prompts']} prompts [{low}, {high}]")
    print(f"A - B: {mean_a - b['mean_acceptance_length']:+.4f}; A is {'inside' if inside else 'OUTSIDE'} B's interval")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"a": args.a, "b": args.b, "set": args.set, "draft_a": args.draft_a, "draft_b": args.draft_b,
                       "paired": False, "mean_acceptance_length_a": mean_a, "b_interval": b, "a_inside_b_interval": inside,
                       "a_acceptance_per_position": a_draft.get("acceptance_per_position")}, out, indent=1)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
