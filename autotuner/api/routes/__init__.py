"""The API routes: thin, one service call each."""
