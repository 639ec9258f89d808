"""zerotrain.operator: the kopf operator for ZeroTrainingJob. Imports no torch."""
