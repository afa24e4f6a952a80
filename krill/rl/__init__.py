"""Reinforcement learning for Krill: tasks and rewards, prompt assignment, rollouts, policy
gradients, gradient compression, robust aggregation and the per-shard optimizer."""
