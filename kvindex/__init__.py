"""The KV index: which blocks each replica's engine holds, in which tier, kept from the engines'
own KV events (kvindex/index.py); the router reads it through `ReplicaLoad`."""
