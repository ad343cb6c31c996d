# results/lineage.json: every job behind the final checkpoint, from the prompt sources and the
# target to final/, read back from the provenance.json each job wrote (inputs with hashes,
# params, versions, commit, wall time). Cheap: runs on the submitting machine.


localrules:
    lineage,


rule lineage:
    input:
        checkpoint="results/checkpoint/final",
        code=code("provenance"),
    output:
        "results/lineage.json",
    log:
        "logs/lineage.log",
    script:
        "../scripts/lineage.py"
