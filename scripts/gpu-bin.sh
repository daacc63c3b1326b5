# Sourced by the GPU scripts: BIN is FERRITE_BIN, or else the stripped
# build carried in target-gpu/ferrite.gz, unpacked to /tmp/ferrite-gpu;
# prints the GPU and its clock.
BIN=${FERRITE_BIN:-}
if [[ -z $BIN ]]; then
    zcat target-gpu/ferrite.gz >/tmp/ferrite-gpu && chmod +x /tmp/ferrite-gpu || exit 1
    BIN=/tmp/ferrite-gpu
fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
