"""The engine core: the one owner of the step (schedule -> execute -> land), and its process, channels and start-up."""
