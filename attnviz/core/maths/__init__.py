"""The attention maths: scenarios, the engines, explanations, costs, experiments."""
