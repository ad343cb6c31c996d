# results/summary.md and .json: one page per run (target, data counts, truncation, disk used, stage
# wall times, the published epoch, acceptance trained vs untrained, warnings), read from what the
# stages wrote (draftline.stages.summary). Cheap: runs on the submitting machine.


localrules:
    summary,


rule summary:
    input:
        final=rules.train.output[0],
        acceptance=rules.evaluate.output.acceptance,
        prompts=rules.prompts.output.summary,
        tokenized=rules.tokenize.output.summary,
        vocab=rules.vocab.output.summary,
        # read when the job runs: every stage's wall time and the disk use of results/
        plots=report_plots(),
    output:
        markdown="results/summary.md",
        json="results/summary.json",
    log:
        "logs/summary.log",
    conda:
        "../envs/gpu.yaml"
    params:
        code=code("stages.summary", script="summary"),
        target=PLAN.summary.target,
        device=PLAN.summary.device,
        benchmarks=PLAN.summary.benchmarks,
        # the page's settings with the run's name (draftline.stages.summary.SummarySettings): an object Snakemake
        # does not compare, so naming, moving or renaming a run reruns nothing
        settings=PLAN.summary,
    script:
        "../scripts/summary.py"
