# results/lineage.json: every job behind the final checkpoint, its evaluation and the report's
# plots, from the prompt sources and the target on, read back from the provenance each job
# wrote (inputs with hashes, params, versions, commit, wall time). Cheap: runs on the
# submitting machine.


localrules:
    lineage,


rule lineage:
    input:
        checkpoint=rules.train.output[0],
        acceptance=rules.evaluate.output.acceptance,
        plots=report_plots(),
    output:
        "results/lineage.json",
    log:
        "logs/lineage.log",
    conda:
        "../envs/gpu.yaml"
    params:
        code=code("lineage.provenance", script="lineage"),
    script:
        "../scripts/lineage.py"
