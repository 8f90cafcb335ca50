"""What the autoscaler remembers of a service across restarts and redeploys (issue 38): priors,
what each remembered bucket of traffic would have missed at each capacity, and whether a start
arrives in time for a burst as long as the remembered ones."""
