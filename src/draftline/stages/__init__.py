"""The pipeline's stages, one module (or package) each, named like its rule file and script:
prompts, target_model, layer_ids, regenerate, tokenize, disk_estimate, hidden_states, vocab,
speculator_config, train (with train.entry, the Trainer's child process), evaluate, report,
summary. A stage imports the shared layers (artifacts, backends, algorithms and the runtime
helpers), never another stage (tests/test_structure.py)."""
