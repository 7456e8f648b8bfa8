"""The agents tier: Faust agents driven through ``agent.test_context()``, no broker."""
