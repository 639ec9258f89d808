"""Built-in entry points for models defined elsewhere: `zerotrain.runtime.models.huggingface:build` builds a
Hugging Face causal LM from its config and trains it on token files."""
