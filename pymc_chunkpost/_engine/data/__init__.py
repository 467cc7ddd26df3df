"""What a call is: `Problem`, `Placement`, and the types several layers share."""
