"""Stage 2, attribute: which pod, container or scheduler job uses each device."""
