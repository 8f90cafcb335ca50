"""What the engine replicas and the front doors share about the engines' KV cache: the KV event
stream from an engine to the doors, and the prompt's token ids as the engine sees them."""
