"""What the autoscaler remembers of a service across restarts and redeploys (issue 38): priors,
and what each remembered bucket of traffic would have missed at each capacity."""
