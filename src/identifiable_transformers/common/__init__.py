"""What every layer uses: user errors and the entry scripts' exit (errors), atomic file writing and full disks
(files), signals (interrupts), log filters (quiet), the configs' OmegaConf resolvers. Imports nothing else of the
package."""
