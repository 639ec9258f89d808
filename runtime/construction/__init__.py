"""How a rank gets its model's starting values without ever holding the whole model.

- `partitioned`: the entry point's model is built with every module's parameters handed over to placeholders as
  soon as the module is registered in its parent; the rank keeps only its slice of each (`placeholders`). Init code
  that runs later over already-built modules (a whole-model init pass: Hugging Face's `post_init`, the built-in
  GPT's loop) is recorded, its randomness drawn exactly as it would be, and replayed unit by unit (`deferred`).
- `materialize`: the engine's `ParameterSource` for such a model: one unit at a time, the slices are gathered, the
  recorded init replayed, and the rank's range kept.
- `pretrained` and `weight_files`: weights from files written by Hugging Face, a zerotrain export or a zerotrain
  checkpoint, read range by range into the rank's shard.
"""
