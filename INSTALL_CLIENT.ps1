# Make an environment named twinkle-client with Twinkle's torch-free client (twinkle_client:
# TwinkleClient, the remote model, sampler and data proxies), for training on a Twinkle server.
# The Windows counterpart of INSTALL_CLIENT.sh, with the same choices:
#
#   .\INSTALL_CLIENT.ps1                 # conda env `twinkle-client` when conda is present,
#                                        # else a venv in ~\.venvs\twinkle-client
#   .\INSTALL_CLIENT.ps1 -Venv DIR       # a venv in DIR, even with conda
#   .\INSTALL_CLIENT.ps1 -WithTinker     # also the Tinker SDK (the `tinker` extra)
#   .\INSTALL_CLIENT.ps1 -FromPypi       # the packages from PyPI, not from this checkout
#   .\INSTALL_CLIENT.ps1 -DryRun         # print the commands, run nothing
#   .\INSTALL_CLIENT.ps1 -Python py      # the interpreter a venv is made from (default: python)
#
# Run `Set-ExecutionPolicy -ExecutionPolicy RemoteSigned -Scope CurrentUser` once first.
# From a checkout (packages\ next to this script) it installs packages\twinkle-mesh and
# packages\twinkle-client; elsewhere, or with -FromPypi, `twinkle-client` from the index.
# Python 3.11 or later. Nothing of torch, transformers or peft is installed; the script
# checks that at the end.
param(
    [string]$Venv = "",
    [switch]$WithTinker,
    [switch]$FromPypi,
    [switch]$DryRun,
    [string]$Python = "python"
)
$ErrorActionPreference = "Stop"
$EnvName = "twinkle-client"

function Invoke-Step {
    param([string]$Exe, [string[]]$Arguments)
    Write-Host "+ $Exe $($Arguments -join ' ')"
    if (-not $DryRun) {
        & $Exe @Arguments
        if ($LASTEXITCODE -ne 0) { throw "INSTALL_CLIENT.ps1: '$Exe $($Arguments -join ' ')' failed ($LASTEXITCODE)" }
    }
}

$Root = $PSScriptRoot
$Extra = if ($WithTinker) { "[tinker]" } else { "" }
if (-not $FromPypi -and (Test-Path (Join-Path $Root "packages\twinkle-client"))) {
    $Packages = @((Join-Path $Root "packages\twinkle-mesh"), ((Join-Path $Root "packages\twinkle-client") + $Extra))
} else {
    $Packages = @("twinkle-client$Extra")
}

$Conda = Get-Command conda -ErrorAction SilentlyContinue
if ($Venv -eq "" -and $Conda) {
    $Known = (& conda env list) | ForEach-Object { ($_ -split '\s+')[0] }
    if ($Known -contains $EnvName) {
        Write-Host "conda env $EnvName exists: installing into it"
    } else {
        Invoke-Step "conda" @("create", "-y", "-n", $EnvName, "python=3.11")
    }
    $EnvExe = "conda"
    $EnvArgs = @("run", "--no-capture-output", "-n", $EnvName, "python")
    $Activate = "conda activate $EnvName"
} else {
    if ($Venv -eq "") { $Venv = Join-Path (Join-Path $HOME ".venvs") $EnvName }
    & $Python -c "import sys; sys.exit(sys.version_info < (3, 11))"
    if ($LASTEXITCODE -ne 0) {
        throw "INSTALL_CLIENT.ps1: '$Python' is not Python 3.11 or later; pass -Python with the path of one"
    }
    $EnvExe = Join-Path $Venv "Scripts\python.exe"
    if (-not (Test-Path $EnvExe)) { Invoke-Step $Python @("-m", "venv", $Venv) }
    $EnvArgs = @()
    $Activate = (Join-Path $Venv "Scripts\Activate.ps1")
}

Invoke-Step $EnvExe ($EnvArgs + @("-m", "pip", "install", "--upgrade", "pip"))
Invoke-Step $EnvExe ($EnvArgs + @("-m", "pip", "install") + $Packages)
if ($DryRun) { exit 0 }

$Check = @'
import importlib.util

import twinkle_client
from twinkle_client import TwinkleClient

heavy = [name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name)]
if heavy:
    raise SystemExit(f"the client environment has {heavy}; it should be torch-free")
print(f"twinkle_client imports from {twinkle_client.__file__}; no torch, transformers or peft")
'@
# A file, not -c: Windows PowerShell 5.1 drops the double quotes inside native arguments.
$CheckFile = Join-Path ([System.IO.Path]::GetTempPath()) "twinkle_client_check.py"
Set-Content -Path $CheckFile -Value $Check -Encoding ASCII
& $EnvExe @($EnvArgs + @($CheckFile))
$Status = $LASTEXITCODE
Remove-Item $CheckFile
if ($Status -ne 0) { throw "INSTALL_CLIENT.ps1: the client environment failed its check" }
Write-Host "Done. Activate it with: $Activate"
