"""relaxc's runtime side: an artifact loaded, run, generating; what a deployment imports."""
