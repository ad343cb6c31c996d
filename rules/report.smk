# Plots for `snakemake --report report.html` (matplotlib, one rule each, under results/report/).
# Each is an input of `all`, so the report has everything once the default target is built.


report: "../report/workflow.rst"


rule report_loss:
    input:
        final=rules.train.output[0],
    output:
        report("results/report/loss.png", caption="../report/loss.rst", category="Training"),
    log:
        "logs/report/loss.log",
    benchmark:
        "results/benchmarks/report/loss.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.report", script="report_plot"),
        plot="loss",
    script:
        "../scripts/report_plot.py"


rule report_acceptance:
    input:
        acceptance=rules.evaluate.output.acceptance,
    output:
        report("results/report/acceptance.png", caption="../report/acceptance.rst", category="Evaluation"),
    log:
        "logs/report/acceptance.log",
    benchmark:
        "results/benchmarks/report/acceptance.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.report", script="report_plot"),
        plot="acceptance",
    script:
        "../scripts/report_plot.py"


rule report_vocab_coverage:
    input:
        token_freq=rules.tokenize.output.token_freq,
        summary=rules.vocab.output.summary,
    output:
        report("results/report/vocab_coverage.png", caption="../report/vocab_coverage.rst", category="Data"),
    log:
        "logs/report/vocab_coverage.log",
    benchmark:
        "results/benchmarks/report/vocab_coverage.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.report", script="report_plot"),
        plot="vocab_coverage",
    script:
        "../scripts/report_plot.py"


rule report_hidden_states_disk:
    input:
        shards=hidden_state_shards(),
    output:
        report("results/report/hidden_states_disk.png", caption="../report/hidden_states_disk.rst", category="Data"),
    log:
        "logs/report/hidden_states_disk.log",
    benchmark:
        "results/benchmarks/report/hidden_states_disk.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.report", script="report_plot"),
        plot="hidden_states_disk",
    script:
        "../scripts/report_plot.py"


rule report_wall_times:
    input:
        # the last stages: every other stage's benchmark file exists once these do
        final=rules.train.output[0],
        acceptance=rules.evaluate.output.acceptance,
    output:
        report("results/report/wall_times.png", caption="../report/wall_times.rst", category="Run"),
    log:
        "logs/report/wall_times.log",
    benchmark:
        "results/benchmarks/report/wall_times.tsv"
    conda:
        "../envs/gpu.yaml"
    threads: 1
    params:
        code=code("stages.report", script="report_plot"),
        plot="wall_times",
        # read when the job runs (report plots' own benchmarks left out)
        benchmarks="results/benchmarks",
    script:
        "../scripts/report_plot.py"
