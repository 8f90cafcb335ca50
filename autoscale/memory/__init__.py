"""What the autoscaler remembers of a service across restarts and redeploys (issue 38): priors."""
