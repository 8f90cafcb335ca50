"""The second driver: replays arrivals on a virtual clock through the same brains the live
system calls (autoscale policies, routing.choose, capacity's engine model), and what is built
on it: the autoscale evaluation harness and the capacity planner's confirmed plans."""
