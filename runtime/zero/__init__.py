"""The ZeRO engine: `ZeroEngine` and the units it owns, their collectives, buffers and memory accounting."""
