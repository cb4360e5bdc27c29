"""Who is calling, and may they: authentication, the authorizer, SCRAM logins and
sessions, password checks, the cluster secret on the inter-broker listener, TLS setup."""
