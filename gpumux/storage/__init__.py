"""Where gpumux's state lives: the engine and its dialect, the models, every query."""
