"""The Serve data plane: the front door (ingress/), the engine replicas (replica/), the control
plane's adapters (control/), the application builders (apps/) and the contract they share (wire/)."""
