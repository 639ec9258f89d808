"""The runtime's tests, one folder per room (zero/, checkpoints/, construction/, job/, models/). This conftest's
folder is on sys.path (pytest's prepend import mode), so each of them imports the shared helpers (`dist_helpers`,
`tiny_models`) by name."""
