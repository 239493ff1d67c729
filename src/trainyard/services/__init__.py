"""Use cases of the control plane: tenants, jobs, pools, scheduling, execution, reconciliation."""
