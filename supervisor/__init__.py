"""inferd supervisor: frontends, repository, schedulers and instance supervision."""
