"""The pipeline runtime: executes a rank's lowered schedule over Paddle p2p."""
