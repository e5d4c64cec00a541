"""Model repository: layout scan, config parsing/normalisation/JSON, auto-complete checks, versions, metadata.

Pure functions and small records; no asyncio, no processes. The model manager composes them:

    src = layout.find_model(repos, name, model_config_name)        # or scan_repositories(...)
    cfg = config.normalize(config.load_config(src, disable_ac), src, has_gpu=...)
    if autocomplete.needs_autocomplete(cfg, disable_ac):
        cfg = autocomplete.apply_autocompleted(cfg, worker_answer_json)
        cfg = config.normalize(cfg, src, has_gpu=...)
    sel = versions.select_versions(cfg.name, cfg.version_policy, src.versions)
"""
