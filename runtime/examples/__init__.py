"""Example entry points for ZeroTrainingJob manifests (`spec.entrypoint`)."""
