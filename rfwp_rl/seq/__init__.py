"""The sequence trainer (``rfwp-rl seq``): language modelling and algorithmic tasks on the
same cores as the RL agents (RFWP paper Sec. 4.1-4.3; Secretly-FWP Sec. 6.1).

Modules: ``model`` (embedding -> core -> output layer), ``attention`` (the softmax Transformer
baseline), ``memory`` (the single-layer memory of Secretly-FWP Sec. 6.1), ``tasks`` (data
generators and the LM corpus/evaluation), ``data`` (the built-in corpus), ``train`` (CLI),
``results`` (collect results into CSV and figures).
"""
