"""What receiving applications embed so at-least-once deliveries have at-most-once effects."""
