package mesh

// secretValues are the API keys the configuration names by environment variable: the
// logger masks their values wherever they appear, also in shapes no pattern knows.
func (c Config) secretValues(getenv func(string) string) []string {
	var envs []string
	for _, p := range c.Router.Providers {
		for _, k := range p.Keys {
			envs = append(envs, k.Env)
		}
	}
	envs = append(envs, c.Cache.Qdrant.APIKeyEnv, c.Cache.Embedder.APIKeyEnv, c.Verifier.L3.Judge.APIKeyEnv, c.Auth.MeshSecretEnv)
	var out []string
	for _, name := range envs {
		if name == "" {
			continue
		}
		if v := getenv(name); v != "" {
			out = append(out, v)
		}
	}
	return out
}
