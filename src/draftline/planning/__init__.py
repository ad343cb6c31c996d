"""The run decided at parse time, before any job starts: the plan rules/common.smk calls (`plan`),
the params that decide each rule's staleness and each job's check of them (`rule_params`), the
config's checks against the target (`config_checks`) and of its files (`config_files`), where jobs go (`cluster`) and what the run
costs (`sizing`, a package: the estimate, its inputs from the config, the plan's line and
docs/sizing.md's tables). The settings themselves, their defaults and the schema are
draftline.settings' (the bottom layer). Nothing imports `plan`."""
