"""The evaluation layer: metrics, OOD scores, temperature scaling, abstention thresholds and the
predictions they are computed from. Imports only the method, data and recipe layers."""
