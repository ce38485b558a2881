"""Training learned rewards: ``reinforge rm`` turns preference pairs into a reward model (an HF
``AutoModelForSequenceClassification`` directory) that the ``reward_model`` reward term scores with."""
